"""``AC_INTERCOM_*``: the Intercom sink's settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sinks._http import NonBlankSecret
from streams.settings import HttpURL, from_environment

__all__ = ["IntercomSettings"]


class IntercomSettings(BaseSettings):
    """``AC_INTERCOM_*``: read only when the Intercom sink is used."""

    model_config = SettingsConfigDict(env_prefix="AC_INTERCOM_", extra="ignore")

    token: NonBlankSecret
    admin_id: str = Field(min_length=1)
    api_base: HttpURL = "https://api.intercom.io"
    version: str = "2.11"
    timeout_s: float = Field(default=10.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1)
    attempts: int = Field(default=4, ge=1)  # fast tries in the sink before the runner's backoff
    not_found_grace_s: float = Field(default=300.0, ge=0)

    @classmethod
    def load(cls) -> IntercomSettings:
        return from_environment(cls, "AC_INTERCOM_")
