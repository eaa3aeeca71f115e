"""`search --html PAGE`: each query photo followed by its nearest catalogue photos, a grid like
the report's retrieval grids (the query framed blue), with each result's rank, distance and
path. The thumbnails are inside the page (JPEG data URIs), so it opens anywhere, moved or
mailed, without the photos beside it.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from harness.core import HarnessError
from harness.core.page_style import CSS, GENERATOR, QUERY_COLOUR
from harness.data.photo_decode import open_photo
from harness.records import write_text_atomic

THUMB = 160  # pixels, the longer side

GRID_CSS = f"""
div.hits {{ display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-start;
            margin-bottom: 1.5em; }}
figure.hit {{ margin: 0; width: {THUMB + 8}px; font-size: 0.8em; }}
figure.hit img {{ border: 4px solid #ddd; max-width: {THUMB}px; }}
figure.query img {{ border-color: {QUERY_COLOUR}; }}
figure.hit figcaption {{ word-break: break-all; }}
"""


def thumbnail(path: Path) -> str:
    """A JPEG data URI of the photo as a viewer shows it (upright, RGB: harness.data.
    photo_decode), THUMB pixels on its longer side; a one-line HarnessError if the photo
    can no longer be decoded."""
    try:
        image = open_photo(path, str(path))
    except FileNotFoundError:
        raise HarnessError(f"{path} no longer exists; index the folder again") from None
    image.thumbnail((THUMB, THUMB))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(src: str, caption: str, query: bool = False) -> str:
    kind = "hit query" if query else "hit"
    return (f'<figure class="{kind}"><img src="{src}" alt="{html.escape(caption)}">'
            f"<figcaption>{caption}</figcaption></figure>")  # fmt: skip


def search_html(folder: Path, queries: list[Path], results: list[list[Any]],
                header: dict[str, Any]) -> str:  # fmt: skip
    """The page's HTML (see the module docstring)."""
    model = header["model"]
    parts = [f"<h1>Search: {len(queries)} quer{'y' if len(queries) == 1 else 'ies'}</h1>",
             f"<p>{header['count']} photos under <code>{html.escape(str(folder))}</code>, "
             f"indexed with {html.escape(model['method'])} (protocol "
             f"{html.escape(model['protocol']['name'])}, weights sha256 "
             f"<code>{model['weights_sha256'][:12]}</code>); index {html.escape(header['index'])}"
             "; Euclidean distance, smaller is closer.</p>"]  # fmt: skip
    for query, hits in zip(queries, results, strict=True):
        cells = [_figure(thumbnail(query), f"query<br>{html.escape(query.name)}", query=True)]
        for hit in hits:
            caption = f"{hit.rank}. {hit.distance:.3f}<br>{html.escape(hit.path)}"
            cells.append(_figure(thumbnail(folder / hit.path), caption))
        parts.append(
            f'<h2>{html.escape(str(query))}</h2>\n<div class="hits">{"".join(cells)}</div>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="generator" content="{GENERATOR}">\n<title>search</title>\n'
        f"<style>{CSS}{GRID_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(parts)
        + "\n</body>\n</html>\n"
    )


def write_search_page(
    page: Path, folder: Path, queries: list[Path], results: list[list[Any]], header: dict[str, Any]
) -> Path:
    """Write the page (atomically) and return its path."""
    write_text_atomic(page, search_html(folder, queries, results, header))
    return page
