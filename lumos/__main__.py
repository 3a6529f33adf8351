from lumos.cli.app import main

main()
