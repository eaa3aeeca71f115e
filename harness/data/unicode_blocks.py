"""Unicode block table: the blocks (from Unicode's Blocks.txt, 14.0) that the glyphs fonts cover.

Only the blocks that occur in the charmaps of the fonts `harness.data.glyphs` keeps are listed,
so the table stays small; `block_of` returns None for a code point outside all listed blocks.
Block ranges have been stable since they were introduced, so the table does not depend on the
Python's own Unicode version.
"""

from __future__ import annotations

import bisect

# (first code point, last code point, block name), sorted by first code point.
BLOCKS: tuple[tuple[int, int, str], ...] = (
    (0x00000, 0x0007F, "Basic Latin"),
    (0x00080, 0x000FF, "Latin-1 Supplement"),
    (0x00100, 0x0017F, "Latin Extended-A"),
    (0x00180, 0x0024F, "Latin Extended-B"),
    (0x00250, 0x002AF, "IPA Extensions"),
    (0x002B0, 0x002FF, "Spacing Modifier Letters"),
    (0x00300, 0x0036F, "Combining Diacritical Marks"),
    (0x00370, 0x003FF, "Greek and Coptic"),
    (0x00400, 0x004FF, "Cyrillic"),
    (0x00500, 0x0052F, "Cyrillic Supplement"),
    (0x00530, 0x0058F, "Armenian"),
    (0x00590, 0x005FF, "Hebrew"),
    (0x00600, 0x006FF, "Arabic"),
    (0x007C0, 0x007FF, "NKo"),
    (0x00E00, 0x00E7F, "Thai"),
    (0x00E80, 0x00EFF, "Lao"),
    (0x010A0, 0x010FF, "Georgian"),
    (0x01400, 0x0167F, "Unified Canadian Aboriginal Syllabics"),
    (0x01680, 0x0169F, "Ogham"),
    (0x01D00, 0x01D7F, "Phonetic Extensions"),
    (0x01D80, 0x01DBF, "Phonetic Extensions Supplement"),
    (0x01DC0, 0x01DFF, "Combining Diacritical Marks Supplement"),
    (0x01E00, 0x01EFF, "Latin Extended Additional"),
    (0x01F00, 0x01FFF, "Greek Extended"),
    (0x02000, 0x0206F, "General Punctuation"),
    (0x02070, 0x0209F, "Superscripts and Subscripts"),
    (0x020A0, 0x020CF, "Currency Symbols"),
    (0x020D0, 0x020FF, "Combining Diacritical Marks for Symbols"),
    (0x02100, 0x0214F, "Letterlike Symbols"),
    (0x02150, 0x0218F, "Number Forms"),
    (0x02190, 0x021FF, "Arrows"),
    (0x02200, 0x022FF, "Mathematical Operators"),
    (0x02300, 0x023FF, "Miscellaneous Technical"),
    (0x02400, 0x0243F, "Control Pictures"),
    (0x02460, 0x024FF, "Enclosed Alphanumerics"),
    (0x02500, 0x0257F, "Box Drawing"),
    (0x02580, 0x0259F, "Block Elements"),
    (0x025A0, 0x025FF, "Geometric Shapes"),
    (0x02600, 0x026FF, "Miscellaneous Symbols"),
    (0x02700, 0x027BF, "Dingbats"),
    (0x027C0, 0x027EF, "Miscellaneous Mathematical Symbols-A"),
    (0x027F0, 0x027FF, "Supplemental Arrows-A"),
    (0x02800, 0x028FF, "Braille Patterns"),
    (0x02900, 0x0297F, "Supplemental Arrows-B"),
    (0x02980, 0x029FF, "Miscellaneous Mathematical Symbols-B"),
    (0x02A00, 0x02AFF, "Supplemental Mathematical Operators"),
    (0x02B00, 0x02BFF, "Miscellaneous Symbols and Arrows"),
    (0x02C60, 0x02C7F, "Latin Extended-C"),
    (0x02D00, 0x02D2F, "Georgian Supplement"),
    (0x02D30, 0x02D7F, "Tifinagh"),
    (0x02E00, 0x02E7F, "Supplemental Punctuation"),
    (0x03000, 0x0303F, "CJK Symbols and Punctuation"),
    (0x03040, 0x0309F, "Hiragana"),
    (0x04DC0, 0x04DFF, "Yijing Hexagram Symbols"),
    (0x0A4D0, 0x0A4FF, "Lisu"),
    (0x0A640, 0x0A69F, "Cyrillic Extended-B"),
    (0x0A700, 0x0A71F, "Modifier Tone Letters"),
    (0x0A720, 0x0A7FF, "Latin Extended-D"),
    (0x0E000, 0x0F8FF, "Private Use Area"),
    (0x0FB00, 0x0FB4F, "Alphabetic Presentation Forms"),
    (0x0FB50, 0x0FDFF, "Arabic Presentation Forms-A"),
    (0x0FE00, 0x0FE0F, "Variation Selectors"),
    (0x0FE20, 0x0FE2F, "Combining Half Marks"),
    (0x0FE70, 0x0FEFF, "Arabic Presentation Forms-B"),
    (0x0FFF0, 0x0FFFF, "Specials"),
    (0x10300, 0x1032F, "Old Italic"),
    (0x1D300, 0x1D35F, "Tai Xuan Jing Symbols"),
    (0x1D400, 0x1D7FF, "Mathematical Alphanumeric Symbols"),
    (0x1EE00, 0x1EEFF, "Arabic Mathematical Alphabetic Symbols"),
    (0x1F030, 0x1F09F, "Domino Tiles"),
    (0x1F0A0, 0x1F0FF, "Playing Cards"),
    (0x1F300, 0x1F5FF, "Miscellaneous Symbols and Pictographs"),
    (0x1F600, 0x1F64F, "Emoticons"),
)

_STARTS = [first for first, _, _ in BLOCKS]


def block_of(code_point: int) -> str | None:
    """The name of the Unicode block holding `code_point`, or None when it is not in the table."""
    i = bisect.bisect_right(_STARTS, code_point) - 1
    if i >= 0 and BLOCKS[i][0] <= code_point <= BLOCKS[i][1]:
        return BLOCKS[i][2]
    return None


def block_start(name: str) -> int:
    """The first code point of the block called `name` (sort key for block names)."""
    for first, _, block in BLOCKS:
        if block == name:
            return first
    raise KeyError(name)
