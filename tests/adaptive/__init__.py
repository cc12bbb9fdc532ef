"""Adaptive coding (``fl_gradcode.adaptive``): latency estimation, the choice of s, s="auto"."""
