"""Test double of ``neural_compressor.torch``."""
