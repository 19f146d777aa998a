"""Dependency warnings a demo user cannot act on, hidden: [`trl_ftis.dependency_warnings`], kept here for the demo's
scripts, which import it first."""

from ..dependency_warnings import DEPENDENCY_MODULES, quiet_dependency_warnings

__all__ = ["DEPENDENCY_MODULES", "quiet_dependency_warnings"]
