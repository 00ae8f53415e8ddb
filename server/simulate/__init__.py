"""``muster simulate``: run the real scheduling core on a scenario file, with no side effects.

``scenario`` loads and validates a scenario (docs/simulate.md); ``run`` runs its cycles and
reports. ``simulate_text`` does both.
"""

from server.simulate.run import run_scenario, simulate_text
from server.simulate.scenario import Scenario, ScenarioError, load_scenario, parse_scenario_text

__all__ = [
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario_text",
    "run_scenario",
    "simulate_text",
]
