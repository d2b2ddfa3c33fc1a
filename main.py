"""Start kvviz: `python main.py` opens the window; `python main.py bench --quick` etc. run the CLI."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] in ([], ["gui"]):
        # the window: the GPU opens on a thread of its own while the command line's and the window's modules load
        from kvviz.gpu.runtime import open_early

        open_early()
    from kvviz.cli import main

    sys.exit(main(sys.argv[1:]))
