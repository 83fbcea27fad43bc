"""The fault matrix (docs/reliability.md): one test per row, each a real run with and without
StallScope, asserting that training does not notice it (the same items, the same exception, the
same exit status), that the report is still whole and readable, and that what StallScope costs
stays bounded."""
