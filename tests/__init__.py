"""fl_gradcode's tests, one folder per layer (packages, so two folders may share a file name)."""
