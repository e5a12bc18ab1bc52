"""The review console (issue #36): answers sent to review meet a person on the admin listener
(``/review/``), and every judgement becomes a verdict. Server-rendered (Jinja2, autoescaped),
a session cookie from an admin key, a CSRF token on every form; no build step."""
