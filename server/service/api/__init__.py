"""The RPC-facing layer, on top of the state: the handler registration (``handlers``), the auth
gate (``gate``) and the read RPCs (``queries``). Only the top (``server.service.rpc``, ``app``
and the dashboard) imports it; the wire conversion it builds on (``convert``, ``validate``,
``views``) sits below the state, in ``server.service``.
"""
