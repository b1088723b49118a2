"""What every room shares: an env's spaces (EnvSpec), packed tensors, and the checkpoint format."""
