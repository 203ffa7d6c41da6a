/* kernels.cu compiled as plain C++ for the host emulator (gpu_emu.h). */
#include "kernels.cu"
