"""The report: typed records, their JSON form, and their rendering."""
