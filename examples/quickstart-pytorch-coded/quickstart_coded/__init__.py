"""quickstart_coded: Flower's PyTorch quickstart with gradient coding."""
