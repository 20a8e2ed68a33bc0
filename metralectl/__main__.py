from metralectl.cli.main import main

main()
