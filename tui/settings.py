"""The cockpit's settings: kept in the core (``localllm.cockpit.settings``), which
loads with them; named here too for the command line and the screens."""

from __future__ import annotations

from localllm.cockpit.settings import POLICIES, RELOAD_FIELDS, SAMPLING_FIELDS, Settings

__all__ = ["POLICIES", "RELOAD_FIELDS", "SAMPLING_FIELDS", "Settings"]
