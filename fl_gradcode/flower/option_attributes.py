"""``GradientCoding``'s options by their flat names, as read-only attributes.

``strategy.timing``, ``strategy.busy_mode`` (the resolved ``busy``), ``strategy.s`` (with
``s="auto"``: the placement's ``s_max``), ... read the strategy's option groups
(:class:`~fl_gradcode.flower.options.Options`): each name is an entry of
:data:`~fl_gradcode.flower.options.FLAT_NAMES` (plus ``seed`` and ``code_options``), so the
attributes and :meth:`Options.get <fl_gradcode.flower.options.Options.get>` answer from one
table. They are read-only: an option is fixed when the strategy is built (its collaborators
were built from it). The one exception is ``accountant``, which may be replaced: the privacy
group is then rebuilt with it, so the options never hold a stale accountant.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..privacy import PrivacyAccountant
from .options import FLAT_NAMES, Options

__all__ = ["OptionAttribute", "OptionAttributes"]


class OptionAttribute:
    """A read-only attribute reading the option ``name`` of its object's ``options``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.__doc__ = f"The option {name!r} (read-only: ``options.get({name!r})``)."

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.options.get(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is an option, fixed when the "
                             f"strategy is built: pass {self.name}=... to the constructor")


class AccountantAttribute(OptionAttribute):
    """``accountant``: readable, and replaceable (the privacy group is rebuilt with it)."""

    def __set__(self, obj: Any, value: PrivacyAccountant | None) -> None:
        options: Options = obj.options
        privacy = dataclasses.replace(options.privacy, accountant=value)
        obj.options = dataclasses.replace(options, privacy=privacy)


class OptionAttributes:
    """Mixin: every flat option name as an attribute of an object holding ``options``."""

    options: Options


for _name in (*FLAT_NAMES, "seed", "code_options"):
    setattr(OptionAttributes, _name,
            AccountantAttribute(_name) if _name == "accountant" else OptionAttribute(_name))
del _name
