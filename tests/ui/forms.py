"""Press a button on a page the way a browser would: find the form around it, send exactly
its fields (the CSRF token included) to its action. Tests that post hand-written data prove
the view works, not that the page's button does."""

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    buttons: list[dict[str, str]] = field(default_factory=list)


class _Forms(HTMLParser):
    def __init__(self):
        super().__init__()
        self.forms: list[Form] = []
        self._open: Form | None = None

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form":
            self._open = Form(attributes.get("action", ""), attributes.get("method", "get"))
            self.forms.append(self._open)
        elif self._open is not None and tag == "input" and "name" in attributes:
            self._open.fields[attributes["name"]] = attributes.get("value", "")
        elif self._open is not None and tag == "button":
            self._open.buttons.append(attributes)

    def handle_endtag(self, tag):
        if tag == "form":
            self._open = None


def form_with_button(html: str, attribute: str, value: str) -> Form:
    """The one form holding a button with `attribute="value"` (e.g. data-rollback="production")."""
    parser = _Forms()
    parser.feed(html)
    found = [f for f in parser.forms if any(b.get(attribute) == value for b in f.buttons)]
    assert len(found) == 1, f"{len(found)} forms have a button with {attribute}={value!r}"
    return found[0]


def button(html: str, attribute: str, value: str) -> dict[str, str]:
    """The attributes of the button with `attribute="value"`."""
    form = form_with_button(html, attribute, value)
    return next(b for b in form.buttons if b.get(attribute) == value)


def press(client, html: str, attribute: str, value: str, *, follow: bool = True):
    """Submit the form of that button with the client (its session and cookies); a disabled
    button cannot be pressed, as in a browser."""
    assert "disabled" not in button(html, attribute, value), f"{attribute}={value!r} is disabled"
    return force_submit(client, html, attribute, value, follow=follow)


def force_submit(client, html: str, attribute: str, value: str, *, follow: bool = True):
    """Send that button's form even when the page disabled it: what the server does then."""
    form = form_with_button(html, attribute, value)
    assert form.method.lower() == "post"
    return client.post(form.action, form.fields, follow=follow)
