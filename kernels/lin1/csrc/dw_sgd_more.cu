#define DW_SGD_VARIANTS 1
#include "dw_sgd.cu"
