"""`ProviderCache`: one provider per model (and per project config), kept for the agent's
life, rebuilt when `crow login`/`crow logout` changed the stored keys, each closed once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from crow import credentials

if TYPE_CHECKING:
    from crow.config import Config
    from crow.llm.base import Provider


class ProviderCache:
    def __init__(self, config: Config) -> None:
        self._config = config  # the user's: where the stored keys live
        self._built: dict[str, Provider] = {}
        self._retired: list[Provider] = []  # built before the stored keys changed; closed at the end
        self._credentials = credentials.stamp(config.home)

    def get(self, ref: str, config: Config) -> Provider:
        """The provider for `ref` as `config` (the user's or a project's) defines it."""
        if (seen := credentials.stamp(self._config.home)) != self._credentials:  # `crow login` ran
            self._credentials, self._retired = seen, [*self._retired, *self._built.values()]
            self._built = {}  # rebuilt with the keys as stored now; in-flight turns keep theirs
        key = ref
        if config is not self._config:  # a project's providers: its own provider objects
            key += " " + config.model_dump_json(include={"providers", "model_settings"})
        if key not in self._built:
            from crow.llm.registry import create_provider

            self._built[key] = create_provider(
                ref, providers=config.providers, models=config.model_settings, home=self._config.home
            )
        return self._built[key]

    async def aclose(self) -> None:
        providers, self._built, self._retired = [*self._retired, *self._built.values()], {}, []
        for provider in providers:
            await provider.aclose()
