"""``muster simulate``: run the real scheduling core on a scenario file. INTERIM signature."""

from __future__ import annotations

from typing import Any


class ScenarioError(ValueError):
    """An invalid scenario: ``problems`` holds one line per problem, each naming the field path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def simulate_text(text: str, cycles: int | None = None) -> dict[str, Any]:
    """Run a scenario (YAML or JSON text); returns the output object of docs/simulate.md."""
    raise ScenarioError(["simulate: not implemented yet"])
