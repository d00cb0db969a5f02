"""What a user types: profiles, the flag table, the run subcommand's grammar, the MCP server's
options, and the errors at the command line's boundary."""
