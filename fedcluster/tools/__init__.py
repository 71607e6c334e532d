"""fedcluster.tools: the command-line tools every algorithm shares, apart from the library they
drive (an algorithm's own tools live in its package: ``fedcluster-kfed-assign`` in
``fedcluster.algorithms.kfed.assign_tool``, ``fedcluster-split-graph`` in
``fedcluster.algorithms.fedspectral.split_tool``).

Each module has a ``main(argv)`` behind a console script of ``pyproject.toml``
``[project.scripts]``, and runs as ``python -m fedcluster.tools.<module>`` too:

==================  ============================  =================================================
module              console script                what it does
==================  ============================  =================================================
``assign``          ``fedcluster-assign``         label a device's own points with a finished
                                                  run's centers, on the device
``plot``            ``fedcluster-plot``           PNG pictures of a finished run from its
                                                  ``result.json`` (needs the ``plot`` extra)
``fetch_graphs``    ``fedcluster-fetch-graphs``   download the SNAP graphs and check their SHA-256
``certs``           ``fedcluster-make-certs``     make the CA, TLS certificate and SuperNode keys
                                                  a secure deployment needs
``local_cluster``   ``fedcluster-local-cluster``  a real, secure Flower deployment on this machine
                                                  (SuperLink, SuperNodes, one run), then stop it
==================  ============================  =================================================

Every tool refuses a bad argument, or a path it cannot write as given, before any work, with
one line ``<tool>: error: argument --x: ...`` and exit code 2 (as argparse); a file whose
contents it cannot use, or work that fails, with one line and exit code 1; never with a
traceback. No tool replaces an existing file without its ``--overwrite`` (``--force``). The
shared pieces are in ``cli`` (:class:`~fedcluster.tools.cli.ToolParser`, argument ranges,
``output_file``/``output_folder``/``save_npy``).

Like the rest of fedcluster, no tool imports flwr (``local_cluster`` starts Flower's
executables as processes); the algorithms never import a tool.
"""
