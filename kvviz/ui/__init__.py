"""The PySide6 + pyqtgraph desktop window. Everything else in kvviz is Qt-free."""
