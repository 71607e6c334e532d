"""Secure aggregation (SecAgg / SecAgg+ on Flower's cryptography): ``protocol`` (its tasks),
``device`` (what a device runs, and the pure helpers both sides share), ``checks`` (how the
server verifies what devices reveal). The server's side is :mod:`fedcluster.server.secure_sum`."""
