"""The names that become folder names under --results-dir, and the one rule they follow.

A protocol's name and a registered method's name each name a results folder
(`runs/<protocol>/<method>/seed<k>.json`, `checkpoints/...`, `tuning/<protocol>/...`), so
each must be one plain path component: it starts with a letter or digit (never `.` or `..`)
and holds only letters, digits, `_`, `.` and `-` (no `/`, `\\`, space or `<`). A registered
method's name holds no `:` either, which marks a name built on demand by a resolver
(`pml:ContrastiveLoss+PairMarginMiner`), and no `+`, which joins a pytorch-metric-learning
loss to its miner and marks a tuned run's folder (`contrastive+tuned`): a method registered
as `contrastive+tuned` would share the tuned contrastive runs' folder.

A folder built from such names (a `pml:` name, a tuned run's `+tuned`) is checked once more
where its path is built (`safe_folder`), so that no name reaches the file system unchecked.
"""

from __future__ import annotations

import re

from harness.core.errors import HarnessError

# a protocol's or a registered method's name: one plain path component
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
NAME_RULE = "start with a letter or digit and hold only letters, digits, '_', '.' and '-'"
# a folder built from names: the above, joined by ':' (a resolver's `prefix:rest`) and '+'
# (`Loss+Miner`, `+tuned`); still one path component that cannot climb out of its parent
FOLDER_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:+-]*"


def is_plain_name(name: object) -> bool:
    """Whether `name` may name a protocol or a registered method (NAME_PATTERN)."""
    return isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) is not None


def safe_folder(name: object, what: str) -> str:
    """`name` as one folder under its parent, or a HarnessError: the second line of defence
    where a results path is built, behind the checks at registration and protocol parsing, so
    that a name like `../../escaped` never writes outside --results-dir."""
    if isinstance(name, str) and re.fullmatch(FOLDER_PATTERN, name):
        return name
    raise HarnessError(
        f"{what} {name!r} cannot name a results folder: a name must {NAME_RULE} (a "
        "pytorch-metric-learning name may add ':' and '+'); rename it"
    )
