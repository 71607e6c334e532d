"""Minimal Flower echo app (the baseline of bench/flwr_scale.py)."""
