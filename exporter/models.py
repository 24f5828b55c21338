"""The base of every configuration model: unknown settings are errors, values never change.

`extra="forbid"` turns a typo in a YAML file into an error naming the setting (config.py
adds a "did you mean"), and `frozen=True` lets sources share one validated config between
threads without copying it. One base, so every model behaves the same way.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
