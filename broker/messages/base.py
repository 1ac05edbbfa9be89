"""The base of every contract: frozen pydantic v2 models that refuse unknown keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# a number that must be finite: what feeds a model or a policy (one NaN or Infinity in a reward
# or an observation would poison every weight it trains; JSON parsers accept both literals)
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
