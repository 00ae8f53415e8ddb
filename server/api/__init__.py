"""The protobuf side of the server state: request validation, proto <-> model conversion, views
of the state as API messages, and the read RPCs (``queries``).

``validate`` and ``convert`` are pure: they never touch the state, the store or the network, so a
whole request is validated before any state changes.
"""
