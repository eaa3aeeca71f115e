"""The look shared by every HTML page and grid the harness writes: the report's pages
(harness.report), `show`'s retrieval grids and `search --html`'s page (harness.deploy.
search_page). It sits in core because those pages live on two layers (report above, deploy
below) and must look alike: one style, stated once.
"""

GENERATOR = "dml-harness report"  # the meta tag that marks a folder as a report we wrote

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #1d1d1d; line-height: 1.45; }
nav.top { margin-bottom: 1em; font-size: 0.95em; }
nav.top a { margin-right: 1.2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f0f0f0; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #fafafa; }
td.wrap { max-width: 40em; word-break: break-word; }
div.scroll { overflow-x: auto; }
table.sortable td { white-space: nowrap; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
p.note { color: #6b4a00; }
figure { margin: 1em 0; }
#glance > figure img { max-width: 1000px; }
figcaption { font-size: 0.9em; color: #333; max-width: 62em; }
div.forests { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr));
              gap: 1.2em; align-items: start; }
details.how { margin: 1em 0; }
details.how summary { cursor: pointer; font-weight: 600; }
"""

CORRECT_COLOUR = "#00b000"  # the frame of a neighbour of the query's class
WRONG_COLOUR = "#e00000"  # the frame of a neighbour of another class
QUERY_COLOUR = "#1f3fbf"  # the query's own frame
