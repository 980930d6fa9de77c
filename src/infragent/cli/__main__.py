"""`python -m infragent.cli`: the console entry."""
from infragent.cli import main

main()
