"""The fedcluster Flower ClientApp (see ``client_app.app``)."""
