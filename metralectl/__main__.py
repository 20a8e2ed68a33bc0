from metralectl.cli.entry import main

main()
