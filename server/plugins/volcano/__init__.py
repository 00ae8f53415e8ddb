"""Volcano's plugins (``profile: volcano``, and under KAI's profile where KAI has no plugin of that
name), each one small module named as Volcano's ``pkg/scheduler/plugins/<name>`` and registered in
``server/plugins/__init__.py`` (``PLUGINS``) under Volcano's name: gang, drf, proportion, capacity,
predicates, nodeorder, binpack, overcommit, conformance, priority, sla, tdm, network-topology-aware,
task-topology. ``fgd`` (fragmentation gradient descent, Weng et al., USENIX ATC'23, Alibaba's GPU
sharing paper) is not Volcano's, but it plugs in as a Volcano-style node scorer, so it lives here.
Each plugin's page is ``docs/plugins/<name>.md``."""
