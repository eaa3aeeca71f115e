"""One small generic registry: register by name, look up with a "did you mean" on typos."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from harness.core.errors import HarnessError

T = TypeVar("T")


def closest(name: str, choices: Iterable[str], *, ignore_case: bool = False) -> str:
    """Return a ' (did you mean X?)' hint for the closest choice, or '' when none is close;
    with ``ignore_case``, 'mAP@R' finds 'map@r' (the hint keeps the choice's own spelling)."""
    if not ignore_case:
        match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
        return f" (did you mean {match[0]!r}?)" if match else ""
    by_lower = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.5)
    return f" (did you mean {by_lower[match[0]]!r}?)" if match else ""


class Registry(Generic[T]):
    """Maps names to entries; duplicates and unknown names are errors, never silent."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        # "prefix:rest" names built on demand (e.g. any library class by name); they are not
        # among names(), so "every registered entry" stays the first-class ones
        self._resolvers: dict[str, tuple[Callable[[str], T], Callable[[], list[str]]]] = {}
        self._resolved: dict[str, T] = {}

    def add_resolver(
        self, prefix: str, resolve: Callable[[str], T], listing: Callable[[], list[str]]
    ) -> None:
        """Entries named `prefix:rest`, built by resolve(rest) on first use (it raises
        HarnessError for a rest it cannot build); listing() says which rests exist."""
        if prefix in self._resolvers:
            raise ValueError(f"{self.kind} prefix {prefix!r} is registered twice")
        self._resolvers[prefix] = (resolve, listing)

    def prefixes(self) -> dict[str, list[str]]:
        """Each resolver prefix with what it can build."""
        return {prefix: listing() for prefix, (_, listing) in sorted(self._resolvers.items())}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Unregister an entry (a plugin's methods when its command ends or its file changed)."""
        self._entries.pop(name, None)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""

        def decorate(entry: T) -> T:
            return self.add(name, entry)

        return decorate

    def get(self, name: str) -> T:
        prefix, _, rest = name.partition(":")
        if name not in self._entries and rest and prefix in self._resolvers:
            if name not in self._resolved:
                self._resolved[name] = self._resolvers[prefix][0](rest)
            return self._resolved[name]
        if name not in self._entries:
            known = sorted(self._entries)
            raise HarnessError(
                f"unknown {self.kind} {name!r}{closest(name, known)}; known: {', '.join(known)}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        """First-class entries, and prefixed ones that resolve."""
        if name in self._entries or name in self._resolved:
            return True
        if not isinstance(name, str) or name.partition(":")[0] not in self._resolvers:
            return False
        try:
            self.get(name)
        except HarnessError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def registered(registry_get: Callable[[str], Any], name: str, where: str) -> Any:
    """A registry's entry, its unknown-name error prefixed with the protocol key."""
    try:
        return registry_get(name)
    except HarnessError as exc:
        raise HarnessError(f"{where}: {exc}") from None


def keyword_names(builder: Callable[..., Any], skip: Iterable[str]) -> list[str] | None:
    """The keyword arguments a builder takes; None when it takes any (**kwargs)."""
    params = inspect.signature(builder).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.name not in skip]
