"""Building blocks of every YAML schema of the testbed (experiments, topologies, server and
capture settings): strict pydantic models and the unit rule of :mod:`testbed.units`.

A quantity carries its unit in the value (``deadline: 80ms``) or in the key (``deadline_ms: 80``),
never neither: :func:`unit_pair` turns the first form into the second.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from testbed.units import UnitError

NAME_RE = r"^[a-z][a-z0-9]*$"


def unit_pair(data: Any, key: str, parse, suffix: str) -> Any:
    """Accept ``key: "<num><unit>"`` or ``key_<suffix>: <num>``; store under ``key_<suffix>``."""
    if not isinstance(data, dict):
        return data
    if key in data and f"{key}_{suffix}" in data:
        raise ValueError(f"give either '{key}' or '{key}_{suffix}', not both")
    if key in data:
        data = dict(data)
        try:
            data[f"{key}_{suffix}"] = parse(data.pop(key), item=key)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    return data


def number_only(v: Any) -> Any:
    if isinstance(v, str):
        raise ValueError(f"{v!r}: this key carries its unit already; give a plain number")
    return v


Num = Annotated[float, BeforeValidator(number_only)]


class StrictModel(BaseModel):
    """Unknown keys are errors, values are frozen, numbers finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
