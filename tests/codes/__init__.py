"""Gradient codes (``fl_gradcode.codes``): encoding, decoding, stability, validation."""
