"""Test double of Intel's ``habana_frameworks`` package (see ``tests/bridge_double/_bridge_double_state.py``)."""
