"""MkDocs hook (mkdocs.yml's `hooks:`): raw HTML in Markdown is shown as text.

The docstrings the API reference renders are plain prose that writes placeholders such as
results/cost/<protocol>.json outside code spans. Passed through as HTML, as Markdown does by
default, a browser would hide `<protocol>` as an unknown tag; here it reads as written. No
page of the manual relies on raw HTML.
"""

from __future__ import annotations

from markdown import Extension, Markdown
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority


class PlainText(Extension):
    """Markdown without raw HTML: the HTML block and inline HTML processors removed."""

    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's name)
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


@event_priority(100)  # before mkdocstrings reads the extensions for its docstrings
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(PlainText())
    return config
