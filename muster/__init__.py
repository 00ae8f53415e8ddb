"""What servers, adapters and clients share: the generated API (``muster.v1``), resource
quantities (``muster.quantity``), logging setup (``muster.logs``) and trace setup and propagation
(``muster.tracing``). Nothing here imports ``server``, ``adapters`` or ``clients``."""
