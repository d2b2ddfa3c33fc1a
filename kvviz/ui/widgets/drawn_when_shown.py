"""A widget whose picture is costly to draw and changes on every compute: drawn now when it is on screen,
otherwise once when it is next shown (a hidden tab redrawn on every compute would cost each compute for
nothing the user sees)."""
from __future__ import annotations


class DrawnWhenShown:
    """Mixin for a QWidget that defines `_draw()` (put the mixin before the Qt class): `redraw()` draws now
    when the widget is visible, else marks the picture stale and `showEvent` draws it."""

    _picture_stale = False

    def redraw(self) -> None:
        if self.isVisible():
            self._picture_stale = False
            self._draw()
        else:
            self._picture_stale = True

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self._picture_stale:
            self._picture_stale = False
            self._draw()
