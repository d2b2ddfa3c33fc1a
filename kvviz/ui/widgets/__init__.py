"""Widgets shared by the window's panels: the method-options editor, the live decode's cache view and
block-pool grid."""
