"""Test double of ``habana_frameworks.torch.hpex.experimental``."""
