"""Muster's own actions, with no Volcano or KAI equivalent: ``reserve`` (Slurm-style reservations
and start estimates for waiting gangs, with the ``reservation`` plugin; both profiles, off unless
configured). Registered in ``server/actions/__init__.py``; its page is
``docs/plugins/reservation.md``."""
