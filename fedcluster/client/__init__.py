"""The fedcluster Flower ClientApp (see ``fedcluster.client.app``)."""
