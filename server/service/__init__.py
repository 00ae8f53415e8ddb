"""The server around the scheduling core: everything that talks to the network, the store or
another process -- the gRPC API, the cluster state and its SQLite store, the cycle loop, the
worker process that runs the core, authentication and TLS, observability. The core
(``server.model``, ``session``, ``plugins``, ``actions``, ``config``, ``scheduler``,
``simulate``) is pure and never imports this package (docs/architecture.md).

What may import what, from the bottom up (each layer uses the core, ``muster`` and the layers
below it):

* the wire: ``errors``, ``convert`` (proto <-> model), ``validate`` (request checks), ``records``
  (the state's rows), ``views`` (records as API messages) -- they import nothing else here;
* leaves beside it: ``logs``, ``store`` (SQLite), ``decisions`` (decision log, watch hubs),
  ``auth``, ``tls``, ``gctune``;
* the state: ``state`` (``ClusterState``) and what changes or reads it: ``ingest`` (backends),
  ``commands`` (users), ``snapshot`` (a cycle's input), ``apply`` (a cycle's result);
* the cycle: ``core_runner`` (the worker process), ``loop`` (cycles, configuration reload),
  ``observability`` (metrics, tracing, cycle history);
* the top: ``api`` (handlers, the auth gate, the read queries), ``rpc`` (the gRPC service),
  ``observability.dashboard``, ``app`` (wires it all), ``main`` (the command line). Nothing
  below imports them (tests/test_layers.py).
"""
