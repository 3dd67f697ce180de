"""Memory text that would run or fetch something if a page rendered it as markup: script tags,
event handlers, ``javascript:`` URLs, SVG, CSS, and markup that loads from another origin.

``{foreign}`` is the base URL of a "foreign" HTTP server the test runs: any request it receives
means a payload escaped into the page. Every payload that could execute sets ``window.__pwned``."""

from __future__ import annotations

__all__ = ["XSS"]

XSS = [
    "<script>window.__pwned = 'script tag'</script>",
    '<script src="{foreign}/script.js"></script>',
    "<img src=x onerror=\"window.__pwned='img onerror'\">",
    '<img src="{foreign}/img.png">',
    "<body onload=\"window.__pwned='body onload'\">",
    "<a href=\"javascript:window.__pwned='js url'\">click me</a>",
    "<iframe src=\"javascript:parent.__pwned='iframe'\"></iframe>",
    '<iframe src="{foreign}/frame"></iframe>',
    '<svg onload="window.__pwned=\'svg onload\'"><circle r="5"/></svg>',
    "<svg><script>window.__pwned='svg script'</script></svg>",
    '<svg><image href="{foreign}/svg-image.png"/></svg>',
    "<style>body { background: url('{foreign}/css-bg.png') }</style>",
    '<link rel="stylesheet" href="{foreign}/evil.css">',
    '<div style="background-image: url({foreign}/inline-style.png)">styled</div>',
    "\"><script>window.__pwned='attribute breakout'</script>",
    "'><img src=x onerror=window.__pwned=1>",
    "</textarea><script>window.__pwned='textarea breakout'</script>",
    "</pre><script>window.__pwned='pre breakout'</script>",
    "<details open ontoggle=\"window.__pwned='details'\">x</details>",
    "<input autofocus onfocus=\"window.__pwned='autofocus'\">",
    '<object data="{foreign}/object"></object>',
    '<embed src="{foreign}/embed">',
    '<meta http-equiv="refresh" content="0;url={foreign}/meta-refresh">',
    '<base href="{foreign}/">',
    '<form action="{foreign}/form"><button>submit</button></form>',
    "{{ 7*7 }} {% raw %}{{ config }}{% endraw %} ${7*7}",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__pwned='mxss'>",
]
