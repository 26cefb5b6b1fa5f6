"""The book's display: listings and tables on the page, the chapters' figures and diagrams, pictures of a launch, the ladder."""
