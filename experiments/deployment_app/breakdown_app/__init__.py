"""A small Flower app (numpy logistic regression) that records wall-clock timestamps."""
