"""Start kvviz: `python main.py` opens the window; `python main.py bench --quick` etc. run the CLI."""
import sys

from kvviz.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
