"""The algorithms, one package each: ``config`` (its run-config section), ``protocol`` (its
tasks), ``device`` (their kernels: what runs on a phone), the server's math and reply checks
in modules of their own, and ``strategy`` (the phases). :data:`PACKAGES` is the one list of
them; :mod:`fedcluster.registry` reads each package's declarations (``ALGORITHMS`` in its
``__init__``). Adding an algorithm: docs/DESIGN.md, "Adding an algorithm"."""

PACKAGES = ("fedkmeans", "kfed", "feddp_kmeans", "fedspectral", "da_ufl", "gmm")
