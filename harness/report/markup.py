"""The HTML of the report (`harness report`): its page shell with the style and the script
that sorts a table by the header clicked, and the small markdown the leaderboard writes
(headings, paragraphs, lists, GitHub tables, `code`, **bold**, links and images) turned
into HTML, so that the report renders the leaderboard's own text and the two cannot
disagree. Plain strings in, plain strings out: the pages themselves are harness.report.html.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from harness.core.page_style import CSS, GENERATOR

# Click a header: sort the rows by that column, ascending, then descending on a second
# click. A column whose every filled cell starts with a number sorts by that number (`54.1 ±
# 1.9` by 54.1, `± 0.8` by 0.8, `2/3 (incomplete)` by 2); others sort as text. Cells with
# no value (`-`, empty) stay last either way; ties keep their order.
SORT_JS = """
(function () {
  var NUMBER = /^[\\s\\u00b1]*([+\\-\\u2212]?\\d+(?:\\.\\d+)?(?:e[+\\-]?\\d+)?)/i;
  function text(cell) { return cell ? cell.textContent.trim() : ""; }
  function missing(t) { return t === "" || t === "-"; }
  function number(t) {
    var m = NUMBER.exec(t);
    return m ? parseFloat(m[1].replace("\\u2212", "-")) : null;
  }
  function sortBy(table, column, header) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    var headers = table.tHead.rows[0].cells;
    for (var h = 0; h < headers.length; h++) { headers[h].removeAttribute("aria-sort"); }
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var items = rows.map(function (row, i) {
      var t = text(row.cells[column]);
      return {row: row, index: i, text: t, number: number(t), missing: missing(t)};
    });
    var numeric = items.some(function (it) { return !it.missing; }) &&
      items.every(function (it) { return it.missing || it.number !== null; });
    var sign = ascending ? 1 : -1;
    items.sort(function (a, b) {
      if (a.missing !== b.missing) { return a.missing ? 1 : -1; }
      if (a.missing) { return a.index - b.index; }
      var c = numeric ? a.number - b.number
                      : a.text.localeCompare(b.text, undefined, {numeric: true});
      return c !== 0 ? sign * c : a.index - b.index;
    });
    items.forEach(function (it) { body.appendChild(it.row); });
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    var headers = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(headers, function (header, column) {
      header.tabIndex = 0;
      header.title = "click to sort (again: the other way)";
      header.addEventListener("click", function () { sortBy(table, column, header); });
      header.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          sortBy(table, column, header);
        }
      });
    });
  });
})();
"""


def inline(text: str, link: Callable[[str], str | None]) -> str:
    """The markdown the leaderboard writes inside a line: `code`, **bold**, [text](href) and
    ![alt](src); everything else escaped. `link` maps an href (None: text only)."""
    parts = text.split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2 and i < len(parts) - 1:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        if i % 2:  # an unmatched backtick
            part = "`" + part
        part = html.escape(part, quote=False)

        def image(m: re.Match[str]) -> str:
            src = link(html.unescape(m[2]))
            if src is None:
                return m[1]
            return f'<img src="{html.escape(src)}" alt="{m[1]}">'

        def anchor(m: re.Match[str]) -> str:
            href = link(html.unescape(m[2]))
            return m[1] if href is None else f'<a href="{html.escape(href)}">{m[1]}</a>'

        part = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", image, part)
        part = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", anchor, part)
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
        out.append(part)
    return "".join(out)


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_html(
    header: list[str], rows: list[list[str]], sortable: bool = True,
    cell_html: Callable[[str, str], str | None] | None = None,
    link: Callable[[str], str | None] = lambda h: h, table_id: str | None = None,
) -> str:  # fmt: skip
    """An HTML table; `cell_html(column, text)` may replace a cell's content (a link)."""
    attrs = ' class="sortable"' if sortable else ""
    attrs += f' id="{table_id}"' if table_id else ""
    head = "".join(f"<th>{inline(h, link)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for column, text in zip(header, row, strict=False):
            content = cell_html(column, text) if cell_html else None
            cells.append(f"<td>{content if content is not None else inline(text, link)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table{attrs}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(body) + "\n</tbody>\n</table></div>")  # fmt: skip


def markdown_html(
    text: str,
    link: Callable[[str], str | None] = lambda h: h,
    table_hook: Callable[[int, list[str], list[list[str]]], str | None] | None = None,
    heading_ids: set[str] | None = None,
) -> str:
    """The markdown the leaderboard writes (headings, paragraphs, `- ` lists, GitHub tables)
    as HTML. `table_hook(index, header, rows)` may render a table itself; every other table
    is sortable. `heading_ids`: the ids the page has used, so that headings get unique ones."""
    used = heading_ids if heading_ids is not None else set()
    out: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []
    lines = text.splitlines()
    tables = 0

    def flush() -> None:
        if paragraph:
            out.append(f"<p>{inline(' '.join(paragraph), link)}</p>")
            paragraph.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i, link)}</li>" for i in items) + "</ul>")
            items.clear()

    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            flush()
        elif line.startswith("#"):
            flush()
            level = len(line) - len(line.lstrip("#"))
            title = line[level:].strip()
            out.append(f'<h{level} id="{unique_id(title, used)}">{inline(title, link)}</h{level}>')
        elif line.startswith("|"):
            flush()
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            header = cells(block[0])
            rows = [cells(b) for b in block[1:] if not re.fullmatch(r"\|[\s:|-]+\|", b.strip())]
            made = table_hook(tables, header, rows) if table_hook else None
            out.append(made if made is not None else table_html(header, rows, link=link))
            tables += 1
            continue
        elif line.startswith("- "):
            if paragraph:
                flush()
            items.append(line[2:])
        else:
            if items:
                flush()
            paragraph.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)


def unique_id(title: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}-{n}"
    used.add(name)
    return name


def html_page(title: str, body: str, depth: int = 0) -> str:
    up = "../" * depth
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="generator" content="{GENERATOR}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f'<nav class="top"><a href="{up}index.html">Leaderboard</a>'
        f'<a href="{up}cost.html">Cost</a></nav>\n'
        f"{body}\n<script>{SORT_JS}</script>\n</body>\n</html>\n"
    )
