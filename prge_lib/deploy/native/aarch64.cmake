# Cross-building for 64-bit Arm Linux (a Jetson board, or Android's arm64-v8a ABI with the NDK's compilers
# instead) with Debian's g++-aarch64-linux-gnu.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
