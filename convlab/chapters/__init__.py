"""The chapters, one module each (chNN_name, named after book/NN_name.ipynb): its figures, its named computations, its exercises' checks and answers."""
