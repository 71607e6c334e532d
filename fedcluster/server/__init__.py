"""The fedcluster Flower ServerApp and one strategy per algorithm."""
