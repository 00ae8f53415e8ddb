"""The fake bare-metal agent (``muster-agent``): a backend whose nodes are an inventory file and
whose tasks are real local processes (docs/agent.md).

* :mod:`adapters.agent.main`: the command line (``muster-agent``) and its wiring to the runtime;
* :mod:`adapters.agent.agent`: :class:`~adapters.agent.agent.FakeAgent`, the ``Backend``:
  resource accounting, binds, evictions, the state dir that survives an agent restart;
* :mod:`adapters.agent.process`: processes seen through ``/proc`` (liveness, process groups);
* :mod:`adapters.agent.inventory`: the inventory file format.
"""
